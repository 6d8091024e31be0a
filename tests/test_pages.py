import pytest

pytestmark = pytest.mark.django_db


def test_the_admin_login_page_renders(client):
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content


def test_the_admin_requires_login(client):
    response = client.get("/admin/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_static_files_are_served_by_whitenoise(client):
    response = client.get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")


def test_the_home_page_names_the_three_roads(client):
    response = client.get("/")
    assert response.status_code == 200
    for road in (b"Knowledge base", b"Local model", b"External model"):
        assert road in response.content
