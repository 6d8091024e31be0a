"""The browser pages. They only render templates; the chat itself talks to the
WebSocket consumer and the DRF API from the page's scripts (chat/static/chat/chat/)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie


@login_required
@ensure_csrf_cookie  # the page's scripts send the cookie's token with every unsafe API call
def chat_page(request):
    return render(request, "chat/chat.html")


@login_required
@ensure_csrf_cookie
def keys_page(request):
    return render(request, "chat/keys.html")
