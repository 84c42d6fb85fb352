#!/bin/sh
echo "memwall: coverage tools are not available in the offline build" >&2
exit 1
