"""Writes to the knowledge base, one module per thing written: entries, their vectors, people's
verdicts on answers, calibration runs. Each is validate-then-mutate, with follow-up work enqueued
on commit."""
