# The Cloudflare API double (orchestrator/lab/cfapi.py) serving the lab's zone.
FROM python:3.11-slim

WORKDIR /opt/migrate
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
RUN pip install --no-cache-dir .
COPY docker/lab_host.py /opt/lab_host.py

VOLUME ["/lab"]
EXPOSE 8443
ENTRYPOINT ["python", "/opt/lab_host.py"]
CMD ["cloudflare-api"]
