"""The settings. Everything deployment-specific comes from the environment.

Defaults are the production-safe choice; conveniences (localhost in ALLOWED_HOSTS, plain-HTTP
cookies) appear only with DEBUG on. docs/configuration.md lists every variable read here. Each
module of this package is one section; this one gathers them for Django
(DJANGO_SETTINGS_MODULE=config.settings). A section imports what it needs of another by name.

Importing the settings reads the environment and nothing else: it starts no server, makes no
folder or file and writes no variable. What a process needs done before its apps load (the
embedded servers and the development secret key with DEBUG on, the var/ and metrics folders) is
done by its entry point, config.bootstrap.process_setup.
"""

# Star imports: Django reads every upper-case name of this module, and each section's names are
# its settings.
from config.settings.base import *  # noqa: F403
from config.settings.chat import *  # noqa: F403
from config.settings.databases import *  # noqa: F403
from config.settings.inference import *  # noqa: F403
from config.settings.knowledge import *  # noqa: F403
from config.settings.observability import *  # noqa: F403
from config.settings.routing import *  # noqa: F403
from config.settings.security import *  # noqa: F403
from config.settings.spend import *  # noqa: F403
from config.settings.web import *  # noqa: F403
from config.settings.worker import *  # noqa: F403
