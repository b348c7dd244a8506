"""Parses Prometheus expositions with the reference Python client's parsers, for the tests.

Reads a JSON list of exposition texts on stdin and writes, for each, what two parsers make of it:
"openmetrics" (the strict OpenMetrics parser: the format `/metrics` declares) and "text" (the
Prometheus text-format parser, which is how endpoint pickers read it). Each is a map from family
name to {"type": ..., "samples": [[name, labels, value], ...]}. A parse error exits non-zero with
the parser's message, naming the exposition.
"""

import json
import sys

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families


def parsed(families):
    out = {}
    for family in families:
        samples = [[s.name, dict(s.labels), s.value] for s in family.samples]
        out[family.name] = {"type": family.type, "samples": samples}
    return out


def main():
    results = []
    for index, text in enumerate(json.load(sys.stdin)):
        entry = {}
        for name, parse in (("openmetrics", openmetrics_families), ("text", text_families)):
            try:
                entry[name] = parsed(parse(text))
            except Exception as error:  # the message is what the test shows
                sys.exit(f"exposition {index}: the {name} parser refused it: {error}")
        results.append(entry)
    json.dump(results, sys.stdout)


main()
