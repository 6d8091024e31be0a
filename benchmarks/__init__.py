"""Load generators and measurement harnesses. Outside the runtime apps: it may import any of
them, and none of them imports it. A Django app only so that its commands run under manage.py."""
