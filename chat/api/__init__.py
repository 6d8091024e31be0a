"""DRF API for integrations (browser session or API key with the `chat` scope), one module per
resource group: sessions, messages (sending one, regenerating the last answer, editing the last
question: `messages`, and their server-sent-event streams: `streams`), search, feedback, usage and
the user's API keys (`keys`). The URLs are chat.urls and config.urls."""
