"""Admin pieces more than one app uses."""


class SuperuserEdits:
    """Rows that reach the host or send data out: a command line and an environment on the GPU
    host, a key or the knowledge base's texts sent to a URL. Only superusers add, change or delete
    them; staff with the view permission look."""

    def has_add_permission(self, request, *args):
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser
