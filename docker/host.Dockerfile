# One lab "server" (source or target): sshd, MariaDB, rsync and the demo app, as in the native lab; with
# LAB_APP=wordpress, Debian's nginx + php8.2-fpm + WordPress instead of the demo app (`lab up --app wordpress`).
# Built from the repository root: docker compose -f docker-compose.test.yml build
FROM debian:12-slim

ENV DEBIAN_FRONTEND=noninteractive
# policy-rc.d: installing mariadb-server or openssh-server must not try to start them inside the build.
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        openssh-server openssh-client rsync mariadb-server mariadb-client mariadb-backup \
        python3 python3-venv ca-certificates procps curl \
        nginx php8.2-fpm php8.2-mysql wordpress \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
    && mkdir -p /run/sshd

WORKDIR /opt/migrate
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY lab ./lab
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir . ./lab
ENV PATH=/opt/venv/bin:$PATH
COPY docker/lab_host.py /opt/lab_host.py

# The lab directory is a volume shared by the three containers, like the native lab's one directory.
VOLUME ["/lab"]
EXPOSE 2222 3307 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/venv/bin/python", "/opt/lab_host.py"]
CMD ["source"]
