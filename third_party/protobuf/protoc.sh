#!/bin/sh
exec /usr/bin/protoc "$@"
