"""The server behind `fastbert serve` (fastbert.commands.serve): an embedding, reranking and
classification server, compatible with text-embeddings-inference's routes and OpenAI's
/v1/embeddings, with dynamic batching.

What MODEL_DIR holds decides what is served (model.py): a sentence-transformers directory ->
/embed and /v1/embeddings; a cross-encoder (a sequence classifier with one label) -> /rerank and
/predict; another sequence classifier -> /predict. The routes: app.py; the batching: batching.py;
the metrics: metrics.py; the OpenAPI document: openapi.py; request fields: fields.py. Needs the
`serve` extra: pip install "fastbert[serve]" (uvicorn, starlette, prometheus_client, orjson).
"""
