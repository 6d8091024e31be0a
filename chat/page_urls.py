"""Browser pages, included at the site root. Where login and logout lead is in settings
(LOGIN_URL, LOGIN_REDIRECT_URL, LOGOUT_REDIRECT_URL)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from chat import views
from core.login_throttle import LoginForm, refused_with_429

urlpatterns = [
    path("", views.chat_page, name="chat"),
    path("keys/", views.keys_page, name="keys"),
    path(
        "accounts/login/",
        # Failed sign-ins are throttled, counted together with the admin's (core.login_throttle).
        refused_with_429(
            auth_views.LoginView.as_view(
                template_name="registration/login.html",
                redirect_authenticated_user=True,
                authentication_form=LoginForm,
            )
        ),
        name="login",
    ),
    # Django's LogoutView takes POST only: a link or an image tag cannot sign a user out.
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]
