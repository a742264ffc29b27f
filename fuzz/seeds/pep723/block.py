# /// script
# requires-python = ">=3.11, <4"
# dependencies = [
#   "requests>=2.31",
#   "rich[jupyter]==13.7.1",
#   "numpy; python_version >= '3.11'",
# ]
# ///
import requests
