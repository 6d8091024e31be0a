from django.urls import path

from chat.api import feedback, messages, search, sessions, streams

urlpatterns = [
    path("sessions/", sessions.SessionListView.as_view(), name="chat-sessions"),
    path("sessions/<int:pk>/", sessions.SessionDetailView.as_view(), name="chat-session"),
    path("sessions/<int:pk>/messages/", messages.MessageListView.as_view(), name="chat-messages"),
    path(
        "sessions/<int:pk>/messages/stream",
        streams.MessageStreamView.as_view(),
        name="chat-messages-stream",
    ),
    path(
        "messages/<int:pk>/regenerate",
        messages.MessageRegenerateView.as_view(),
        name="chat-message-regenerate",
    ),
    path(
        "messages/<int:pk>/regenerate/stream",
        streams.MessageRegenerateStreamView.as_view(),
        name="chat-message-regenerate-stream",
    ),
    path("messages/<int:pk>/edit", messages.MessageEditView.as_view(), name="chat-message-edit"),
    path(
        "messages/<int:pk>/edit/stream",
        streams.MessageEditStreamView.as_view(),
        name="chat-message-edit-stream",
    ),
    path("search", search.SearchView.as_view(), name="chat-search"),
    path(
        "messages/<int:pk>/feedback",
        feedback.MessageFeedbackView.as_view(),
        name="chat-message-feedback",
    ),
]
