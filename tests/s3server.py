"""A real S3-compatible server for the tests: moto's server mode in its own process on localhost."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import s3fs


class S3Server:
    """``python -m moto.server`` on a free localhost port; its request log counts the GETs. With
    ``auth``, requests must carry the keys of an IAM user the server creates first."""

    def __init__(self, log: Path, auth: bool = False) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        # moto checks credentials after this many requests: the three that make the user and its keys.
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"} if auth else None
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env)
        deadline = time.monotonic() + 120  # starting moto imports a lot: slow on a busy machine
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"moto server did not start: {log.read_text()}") from None
                time.sleep(0.1)
        key, secret = self._user() if auth else ("testing", "testing")
        self.options = {"key": key, "secret": secret, "skip_instance_cache": True,
                        "client_kwargs": {"endpoint_url": self.url, "region_name": "eu-west-1"},
                        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10}}
        self.fs = s3fs.S3FileSystem(**self.options)

    def _user(self) -> tuple[str, str]:
        iam = boto3.client("iam", endpoint_url=self.url, region_name="eu-west-1", aws_access_key_id="x",
                           aws_secret_access_key="x")
        iam.create_user(UserName="stoker")
        key = iam.create_access_key(UserName="stoker")["AccessKey"]
        everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="stoker", PolicyName="all", PolicyDocument=json.dumps(everything))
        return key["AccessKeyId"], key["SecretAccessKey"]

    def gets(self, key_part: str) -> int:
        """GET requests so far whose path contains ``key_part``."""
        return self.requests("GET", key_part)

    def requests(self, method: str, key_part: str) -> int:
        """``method`` requests so far whose path contains ``key_part``."""
        log = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text())  # werkzeug colours some lines
        return len(re.findall(rf'"{method} [^ "]*{re.escape(key_part)}[^ "]* HTTP', log))

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
