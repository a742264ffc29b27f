#!/usr/bin/env python3
"""A script."""
# /// script
# dependencies = ["six"]
# [tool.uv]
# exclude-newer = "2024-01-01T00:00:00Z"
# ///
print(1)
