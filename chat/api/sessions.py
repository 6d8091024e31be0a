"""The chat API's sessions: list, create, read, rename and delete the user's conversations."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from chat import selectors, services
from chat.auth import ChatScope
from chat.models import ChatSession
from core.fields import TextField


class SessionSerializer(serializers.ModelSerializer):
    title = TextField(max_length=200, required=False, allow_blank=True)

    class Meta:
        model = ChatSession
        fields = ["id", "title", "source", "created_at", "updated_at"]
        read_only_fields = ["id", "source", "created_at", "updated_at"]


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


class SessionListView(APIView):
    permission_classes = [ChatScope]

    @extend_schema(responses=SessionSerializer(many=True))
    def get(self, request):
        sessions = selectors.sessions_list(user=request.user)
        paginator = Pagination()
        page: list | None = paginator.paginate_queryset(sessions, request, view=self)
        return paginator.get_paginated_response(SessionSerializer(page, many=True).data)

    @extend_schema(request=SessionSerializer, responses={201: SessionSerializer})
    def post(self, request):
        data = SessionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        session = services.session_create(
            user=request.user, title=data.validated_data.get("title", "")
        )
        return Response(SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    permission_classes = [ChatScope]

    @extend_schema(responses=SessionSerializer)
    def get(self, request, pk):
        return Response(
            SessionSerializer(selectors.session_get(user=request.user, session_id=pk)).data
        )

    @extend_schema(request=SessionSerializer, responses=SessionSerializer)
    def patch(self, request, pk):
        session = selectors.session_get(user=request.user, session_id=pk)
        data = SessionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        session = services.session_rename(
            session=session, title=data.validated_data.get("title", "")
        )
        return Response(SessionSerializer(session).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk):
        services.session_delete(session=selectors.session_get(user=request.user, session_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
