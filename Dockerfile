# ckptwatch: one image for every stage (collect, detect, sink, run).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY ckptwatch ./ckptwatch
RUN pip install --no-cache-dir .
ENTRYPOINT ["ckptwatch"]
