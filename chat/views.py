"""The browser pages. They only render templates; the chat itself talks to the
WebSocket consumer and the DRF API from chat.js."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse_lazy
from django.views.decorators.csrf import ensure_csrf_cookie

# The site-wide LOGIN_URL is the admin's, whose form turns away non-staff users.
LOGIN_URL = reverse_lazy("login")


@login_required(login_url=LOGIN_URL)
@ensure_csrf_cookie  # chat.js sends the cookie's token with every unsafe API call
def chat_page(request):
    return render(request, "chat/chat.html")


@login_required(login_url=LOGIN_URL)
@ensure_csrf_cookie
def keys_page(request):
    return render(request, "chat/keys.html")
