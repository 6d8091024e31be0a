"""DRF API for integrations: entries CRUD and search with the direct-answer verdict."""

from django.db import models
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import DjangoModelPermissions, IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import TextField
from knowledge.models import Entry
from knowledge.selectors import context_passages, direct_answer
from knowledge.services.entries import entry_create, entry_delete, entry_update

MAX_QUERY_CHARS = 2000


class KBPermission(DjangoModelPermissions):
    """Staff users holding the model's permission for the method, as the admin grants them:
    reading (searching, answering) needs view, creating add, editing change, deleting delete.
    By browser session, or by an API key that carries the `kb` scope (the key's user's
    permissions apply)."""

    model: type[models.Model] = Entry
    VIEW = ["%(app_label)s.view_%(model_name)s"]
    perms_map = {**DjangoModelPermissions.perms_map, "GET": VIEW, "HEAD": VIEW, "OPTIONS": VIEW}

    def has_permission(self, request, view):
        if not IsAdminUser().has_permission(request, view):
            return False
        scopes = getattr(request.auth, "scopes", None)  # an API key (the chat app's), duck-typed
        if scopes is not None and "kb" not in scopes:
            self.message = "This API key lacks the kb scope."
            return False
        needed = self.get_required_permissions(request.method, self.model)
        if not request.user.has_perms(needed):
            self.message = f"This needs the {', '.join(needed)} permission."
            return False
        return True


class EntrySerializer(serializers.ModelSerializer):
    question = TextField(help_text=Entry._meta.get_field("question").help_text)
    answer = TextField(help_text=Entry._meta.get_field("answer").help_text)
    aliases = serializers.ListField(child=TextField(), required=False)
    tags = serializers.ListField(child=TextField(max_length=64), required=False)

    class Meta:
        model = Entry
        fields = [
            "id",
            "kind",
            "question",
            "aliases",
            "answer",
            "tags",
            "active",
            "needs_review",
            "reviewed_at",
            "threshold",
            "version",
            "created_at",
            "updated_at",
        ]
        # Review ends only by activating the entry (knowledge.services.entries.entry_update), never
        # by a write of its own.
        read_only_fields = [
            "id",
            "needs_review",
            "reviewed_at",
            "version",
            "created_at",
            "updated_at",
        ]


class EntryPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class EntryFilterSerializer(serializers.Serializer):
    """The list's filters: a bad value is a 400 that names it, never a query PostgreSQL refuses."""

    kind = serializers.ChoiceField(choices=Entry.Kind.choices, required=False)
    active = serializers.BooleanField(required=False, allow_null=True, default=None)
    tag = TextField(max_length=64, required=False)


class EntryListView(APIView):
    permission_classes = [KBPermission]

    @extend_schema(
        parameters=[EntryFilterSerializer, OpenApiParameter("page", int)],
        responses=EntrySerializer(many=True),
    )
    def get(self, request):
        filters = EntryFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        params = filters.validated_data
        entries = Entry.objects.order_by("pk")
        if kind := params.get("kind"):
            entries = entries.filter(kind=kind)
        if params.get("active") is not None:
            entries = entries.filter(active=params["active"])
        if tag := params.get("tag"):
            entries = entries.filter(tags__contains=[tag.lower()])
        paginator = EntryPagination()
        page = paginator.paginate_queryset(entries, request, view=self)
        return paginator.get_paginated_response(EntrySerializer(page, many=True).data)

    @extend_schema(request=EntrySerializer, responses={201: EntrySerializer})
    def post(self, request):
        serializer = EntrySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        entry = entry_create(**serializer.validated_data, author=request.user)
        return Response(EntrySerializer(entry).data, status=status.HTTP_201_CREATED)


class EntryDetailView(APIView):
    permission_classes = [KBPermission]

    @extend_schema(responses=EntrySerializer)
    def get(self, request, pk):
        return Response(EntrySerializer(get_object_or_404(Entry, pk=pk)).data)

    @extend_schema(request=EntrySerializer, responses=EntrySerializer)
    def put(self, request, pk):
        return self._update(request, pk, partial=False)

    @extend_schema(request=EntrySerializer, responses=EntrySerializer)
    def patch(self, request, pk):
        return self._update(request, pk, partial=True)

    def _update(self, request, pk, *, partial):
        entry = get_object_or_404(Entry, pk=pk)
        serializer = EntrySerializer(entry, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        entry = entry_update(entry=entry, **serializer.validated_data)
        return Response(EntrySerializer(entry).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk):
        entry_delete(entry=get_object_or_404(Entry, pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class SearchQuerySerializer(serializers.Serializer):
    q = TextField(max_length=MAX_QUERY_CHARS, trim_whitespace=True)
    k = serializers.IntegerField(min_value=1, max_value=20, default=5)


class MatchSerializer(serializers.Serializer):
    entry_id = serializers.IntegerField(source="entry.pk")
    question = serializers.CharField(source="entry.question")
    phrasing = serializers.CharField()
    score = serializers.FloatField()


class DirectSerializer(serializers.Serializer):
    hit = serializers.BooleanField()
    method = serializers.CharField()
    reason = serializers.CharField()
    entry = EntrySerializer(allow_null=True)
    score = serializers.FloatField(allow_null=True)
    threshold = serializers.FloatField(allow_null=True)
    margin = serializers.FloatField(allow_null=True)
    runner_up = MatchSerializer(allow_null=True)


class PassageSerializer(serializers.Serializer):
    entry_id = serializers.IntegerField()
    label = serializers.CharField()  # type: ignore[assignment]  # a declared field, not Field.label
    kind = serializers.CharField()
    score = serializers.FloatField()
    text = serializers.CharField()


class SearchResultSerializer(serializers.Serializer):
    query = serializers.CharField()
    direct = DirectSerializer()
    matches = MatchSerializer(many=True)
    context = PassageSerializer(many=True)  # type: ignore[assignment]  # a declared field, not Field.context


class SearchView(APIView):
    permission_classes = [KBPermission]

    @extend_schema(parameters=[SearchQuerySerializer], responses=SearchResultSerializer)
    def get(self, request):
        params = SearchQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q, k = params.validated_data["q"], params.validated_data["k"]
        result = direct_answer(q, with_matches=True)
        body = {
            "query": q,
            "direct": result,
            "matches": result.matches[:k],
            "context": context_passages(q, k=k),
        }
        return Response(SearchResultSerializer(body).data)


class AnswerSerializer(serializers.Serializer):
    query = serializers.CharField()
    hit = serializers.BooleanField()
    method = serializers.CharField()
    reason = serializers.CharField()
    entry_id = serializers.IntegerField(allow_null=True)
    answer = serializers.CharField(allow_null=True)
    score = serializers.FloatField(allow_null=True)


class AnswerView(APIView):
    """The KB road alone: the stored answer when the KB can answer by itself, else a miss."""

    permission_classes = [KBPermission]

    @extend_schema(
        parameters=[OpenApiParameter("q", str, required=True)], responses=AnswerSerializer
    )
    def get(self, request):
        params = SearchQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = params.validated_data["q"]
        result = direct_answer(q)
        entry = result.entry if result.hit else None
        # Built as AnswerSerializer documents it, without running it: this is the KB's hot path,
        # and the serializer would only copy these plain values.
        return Response(
            {
                "query": q,
                "hit": result.hit,
                "method": result.method,
                "reason": result.reason,
                "entry_id": entry.pk if entry else None,
                "answer": entry.answer if entry else None,
                "score": result.score,
            }
        )
