from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledge.api import KBPermission
from routing.models import RoutingRule
from routing.selectors import route_explain


class ExplainRequestSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=32000)
    user = serializers.CharField(
        required=False, help_text="Username whose groups the rules should see."
    )
    client = serializers.CharField(required=False, default="web", max_length=100)
    model = serializers.CharField(required=False, allow_null=True, max_length=200)

    def validate_user(self, value):
        user = get_user_model().objects.filter(username=value).first()
        if user is None:
            raise serializers.ValidationError(f"no user named {value!r}")
        return user


class ExplainPermission(KBPermission):
    """Reading the rules: the explanation lists every rule's conditions and the endpoints' failures,
    and runs nothing, so its POST needs the rules' view permission only. As for the KB API: a staff
    session, or a staff user's key with the `kb` scope (a chat key reaches chat only)."""

    model = RoutingRule
    perms_map = {**KBPermission.perms_map, "POST": KBPermission.VIEW}


class ExplainView(APIView):
    """Why would this question take the road it takes? Nothing is generated."""

    permission_classes = [ExplainPermission]

    @extend_schema(
        request=ExplainRequestSerializer,
        responses=inline_serializer(
            "Explanation",
            {
                "text": serializers.CharField(),
                "decision": serializers.DictField(),
                "kb": serializers.DictField(),
                "rules": serializers.ListField(),
                "chain": serializers.ListField(),
            },
        ),
    )
    def post(self, request):
        params = ExplainRequestSerializer(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        user = data.get("user")
        groups = frozenset(user.groups.values_list("name", flat=True)) if user else frozenset()
        result = async_to_sync(route_explain)(
            text=data["text"], groups=groups, client=data["client"], model=data.get("model")
        )
        return Response(result)
