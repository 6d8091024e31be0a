"""The user's API keys: list, create (the key shown once) and revoke. Browser session only: a key
cannot make or list keys."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from chat import apikeys, selectors
from chat.auth import SessionOnly
from chat.models import ApiKey
from core.fields import TextField


class ApiKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"]


class ApiKeyCreateSerializer(serializers.Serializer):
    name = TextField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiKey.Scope.values), default=["chat"]
    )


class ApiKeyListView(APIView):
    permission_classes = [SessionOnly]

    @extend_schema(responses=ApiKeySerializer(many=True))
    def get(self, request):
        keys = selectors.apikeys_list(user=request.user)
        return Response({"results": ApiKeySerializer(keys, many=True).data})

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeySerializer})
    def post(self, request):
        data = ApiKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key, raw = apikeys.apikey_create(user=request.user, **data.validated_data)
        return Response({**ApiKeySerializer(key).data, "key": raw}, status=status.HTTP_201_CREATED)


class ApiKeyDetailView(APIView):
    permission_classes = [SessionOnly]

    @extend_schema(responses={204: None})
    def delete(self, request, pk):
        key = selectors.apikey_get(user=request.user, key_id=pk)
        if key is None:
            raise NotFound(
                f"No API key {pk}."
            )  # the error shape comes from core.errors, as everywhere
        apikeys.apikey_revoke(key=key)
        return Response(status=status.HTTP_204_NO_CONTENT)
