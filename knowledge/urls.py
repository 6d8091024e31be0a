from django.urls import path

from knowledge import api

urlpatterns = [
    path("entries/", api.EntryListView.as_view(), name="kb-entries"),
    path("entries/<int:pk>/", api.EntryDetailView.as_view(), name="kb-entry"),
    path("search", api.SearchView.as_view(), name="kb-search"),
    path("answer", api.AnswerView.as_view(), name="kb-answer"),
]
