#!/bin/sh
# Runs inside LocalStack once it is ready: prove S3 and SQS answer before the operator starts.
set -eu
awslocal s3api list-buckets >/dev/null
awslocal sqs list-queues >/dev/null
echo "provisioner: LocalStack S3 and SQS are ready"
