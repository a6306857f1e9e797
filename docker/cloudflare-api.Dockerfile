# The Cloudflare API double (lab/migrate_lab/cfapi.py) serving the lab's zone.
FROM python:3.11-slim

WORKDIR /opt/migrate
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY lab ./lab
RUN pip install --no-cache-dir . ./lab
COPY docker/lab_host.py /opt/lab_host.py

VOLUME ["/lab"]
EXPOSE 8443
ENTRYPOINT ["python", "/opt/lab_host.py"]
CMD ["cloudflare-api"]
