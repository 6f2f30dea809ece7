#!/bin/sh
# LocalStack init hook: create the bucket conf/localstack.toml points at.
set -eu
awslocal s3 mb s3://tierd || true
