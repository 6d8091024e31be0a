"""Development tooling: `make run`'s orchestrator and the embedded PostgreSQL and Redis it and the
tests use when DATABASE_URL / REDIS_URL are unset. Not imported by the runtime apps."""
