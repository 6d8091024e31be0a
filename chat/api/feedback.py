"""The chat API's verdicts: 👍 or 👎 on one of the user's answers."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from chat.auth import ChatScope
from chat.feedback import message_feedback
from chat.models import ApiKey
from core.fields import TextField
from observability.models import RequestLog


class FeedbackSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(
        choices=["up", "down", ""],
        help_text="`up` (right), `down` (wrong) or empty to take a verdict back.",
    )
    comment = TextField(required=False, allow_blank=True, default="", max_length=2000)


class FeedbackReplySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    verdict = serializers.CharField()
    note = serializers.CharField(
        help_text="Empty, or what to tell the user of their verdict: a 👎 past their daily "
        "allowance of answers sent for review is kept but sent to no reviewer."
    )


class MessageFeedbackView(APIView):
    """POST a verdict on one of your answers: 👍 `up` or 👎 `down` (and a comment). A 👎 on a
    direct answer from the knowledge base puts it in the curators' review queue."""

    permission_classes = [ChatScope]

    @extend_schema(request=FeedbackSerializer, responses=FeedbackReplySerializer)
    def post(self, request, pk):
        data = FeedbackSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        message, note = message_feedback(
            user=request.user,
            message_id=pk,
            verdict=data.validated_data["verdict"],
            comment=data.validated_data["comment"],
            # The chat page posts with the browser's session; integrations with a key.
            interface=RequestLog.Interface.API
            if isinstance(request.auth, ApiKey)
            else RequestLog.Interface.WEB,
        )
        return Response({"id": message.pk, "verdict": message.verdict, "note": note})
