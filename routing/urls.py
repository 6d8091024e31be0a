from django.urls import path

from routing import api

urlpatterns = [
    path("explain", api.ExplainView.as_view(), name="routing-explain"),
]
