"""The runner of every broken test module: POST each prompt to /echo, collect the texts."""

from __future__ import annotations

import json
import os
import sys

from oarbank_sdk import service_endpoint as ep


def main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:
        print(json.dumps({"ok": True}))
        return 0
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    with open(args["--spec"], encoding="utf-8") as f:
        payload = json.load(f)["payload"]
    texts = [ep.request("echo", "POST", "/echo", {"prompt": p}).json()["text"]
             for p in payload["prompts"]]
    tmp = args["--out"] + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        result = {"envelope": 1, "payload": {"texts": texts}}
        if os.environ.get("BROKEN_RESULT") == "no_envelope":  # set by the manifest's [runner].env
            del result["envelope"]
        json.dump(result, f)
    os.replace(tmp, args["--out"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
