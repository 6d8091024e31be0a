"""The chat API's search over the user's own messages."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.views import APIView

from chat import selectors
from chat.api.sessions import Pagination
from chat.auth import ChatScope


class SearchHitSerializer(serializers.Serializer):
    message_id = serializers.IntegerField()
    session_id = serializers.IntegerField()
    session_title = serializers.CharField()
    role = serializers.CharField()
    snippet = serializers.CharField(help_text="Plain text around the first match.")
    created_at = serializers.DateTimeField()


class SearchPagination(Pagination):
    page_size = 20
    max_page_size = 100


class SearchView(APIView):
    """GET `?q=…`: your own messages that contain every word of `q` (Chinese, Japanese and Korean
    text matched by its characters), best match first, with the session to open at each. An empty
    query, or one over 200 characters, is a 400."""

    permission_classes = [ChatScope]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "q", str, required=True, description="Words to find (1 to 200 chars)."
            ),
            OpenApiParameter("page", int, description="A page of 20 hits, from 1."),
            OpenApiParameter("page_size", int, description="Hits per page, at most 100."),
        ],
        responses=SearchHitSerializer(many=True),
    )
    def get(self, request):
        query = selectors.search_query_validate(request.query_params.get("q", ""))
        hits = selectors.messages_search(user=request.user, query=query)
        paginator = SearchPagination()
        page: list | None = paginator.paginate_queryset(hits, request, view=self)  # type: ignore[arg-type]  # SearchHits slices like a list
        results = [
            {
                "message_id": hit.message_id,
                "session_id": hit.session_id,
                "session_title": hit.session_title,
                "role": hit.role,
                "snippet": selectors.search_snippet(hit.content, query),
                "created_at": hit.created_at,
            }
            for hit in page  # type: ignore[union-attr]  # the class sets a page size
        ]
        return paginator.get_paginated_response(SearchHitSerializer(results, many=True).data)
