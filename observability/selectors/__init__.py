"""Reads for the operators' dashboard, one module per thing read: the periods, the request log,
the engines and endpoints, the KB's curation loop, spending."""
