"""Personal data in a question: what it holds (the detector), offline, in English and Chinese.

The ground under knowledge and routing: imports only `core`. The routing condition, the endpoint
policy and the redaction build on `privacy.detector.detect`.
"""
