from django.urls import path

from chat import api

urlpatterns = [
    path("sessions/", api.SessionListView.as_view(), name="chat-sessions"),
    path("sessions/<int:pk>/", api.SessionDetailView.as_view(), name="chat-session"),
    path("sessions/<int:pk>/messages/", api.MessageListView.as_view(), name="chat-messages"),
    path(
        "sessions/<int:pk>/messages/stream",
        api.MessageStreamView.as_view(),
        name="chat-messages-stream",
    ),
    path(
        "messages/<int:pk>/regenerate",
        api.MessageRegenerateView.as_view(),
        name="chat-message-regenerate",
    ),
    path(
        "messages/<int:pk>/regenerate/stream",
        api.MessageRegenerateStreamView.as_view(),
        name="chat-message-regenerate-stream",
    ),
    path("messages/<int:pk>/edit", api.MessageEditView.as_view(), name="chat-message-edit"),
    path(
        "messages/<int:pk>/edit/stream",
        api.MessageEditStreamView.as_view(),
        name="chat-message-edit-stream",
    ),
    path("search", api.SearchView.as_view(), name="chat-search"),
    path(
        "messages/<int:pk>/feedback",
        api.MessageFeedbackView.as_view(),
        name="chat-message-feedback",
    ),
]
