"""The site's URLs plus one view that fails: for the test that a 500 page carries the security
headers."""

from django.urls import path

from config.urls import urlpatterns as site


def boom(request):
    raise RuntimeError("a bug in a view")


urlpatterns = [path("boom/", boom), *site]
