import os

from django.core.wsgi import get_wsgi_application

from config.bootstrap import process_setup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
process_setup()

application = get_wsgi_application()
