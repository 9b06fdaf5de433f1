"""Stand-in for upstream's reel runner, written here: it imports what upstream's imports
(``from oarbank_sdk.control import Checkpoints, Control, Stopped, replace_text``) and behaves
as upstream's documents: one frame a step (a small PNG and its thumbnail), a safe point before
each, a checkpoint every ``every`` frames and when a stop asks for one, resumption after the
last checkpointed frame, and with ``asset`` a listing of the mounted dataset's files.
"""

import argparse
import hashlib
import json
import shutil
import struct
import sys
import time
import zlib
from pathlib import Path

from oarbank_sdk.control import Checkpoints, Control, Stopped, replace_text

SIZE, THUMB = 8, 2


def frame_name(i):
    return f"frame-{i:04d}.png"


def png(rgb, side):
    """A truecolour PNG of ``side`` x ``side`` pixels from ``rgb`` (3 bytes a pixel)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + rgb[y * side * 3:(y + 1) * side * 3] for y in range(side))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def pixels(seed, i):
    out = b""
    block = 0
    while len(out) < SIZE * SIZE * 3:
        out += hashlib.sha256(f"{seed}/{i}/{block}".encode()).digest()
        block += 1
    return out[:SIZE * SIZE * 3]


def run(spec_file, workdir, out, events):
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    p = spec.get("payload") or {}
    frames, seed = p.get("frames"), p.get("seed", 0)
    step_ms, every = p.get("step_ms", 0), p.get("every", 4)
    if type(frames) is not int or not 1 <= frames <= 240:
        replace_text(workdir / "failure.json", json.dumps(
            {"reason": "reel/bad_spec", "detail": f"frames must be 1..240, got {frames!r}"}))
        return 2
    ctl = Control(workdir)
    ckpt = Checkpoints(workdir, events, spec)
    frames_dir, thumbs_dir = workdir / "out" / "frames", workdir / "out" / "thumbs"
    frames_dir.mkdir(parents=True)
    thumbs_dir.mkdir()
    digests, start = [], 0
    if ckpt.resume():
        state = json.loads((ckpt.resume_dir() / "state.json").read_text(encoding="utf-8"))
        digests, start = list(state["digests"]), int(state["next"])
        for k in range(start):
            shutil.copyfile(ckpt.resume_dir() / "frames" / frame_name(k), frames_dir / frame_name(k))
            shutil.copyfile(ckpt.resume_dir() / "thumbs" / frame_name(k), thumbs_dir / frame_name(k))

    def checkpoint(upto):
        with ckpt.write({"next": upto}) as d:
            for sub, src in (("frames", frames_dir), ("thumbs", thumbs_dir)):
                (d / sub).mkdir()
                for k in range(upto):
                    shutil.copyfile(src / frame_name(k), d / sub / frame_name(k))
            (d / "state.json").write_text(json.dumps({"next": upto, "digests": digests}))

    ctl.phase("render")
    i = start
    try:
        while i < frames:
            ctl.safe_point()
            rgb = pixels(seed, i)
            (frames_dir / frame_name(i)).write_bytes(png(rgb, SIZE))
            (thumbs_dir / frame_name(i)).write_bytes(png(rgb[:THUMB * THUMB * 3], THUMB))
            digests.append(hashlib.sha256(rgb).hexdigest())
            i += 1
            if step_ms:
                time.sleep(step_ms / 1000)
            if i % every == 0 and i < frames:
                checkpoint(i)
    except Stopped:
        if ctl.checkpoint_requested and i > start:
            checkpoint(i)
        return ctl.acknowledge_stop()
    ctl.phase("finishing")
    (workdir / "out" / "render.txt").write_text(
        f"reel stand-in: {frames} frames, seed {seed}, resumed at frame {start}\n")
    shutil.copyfile(Path(__file__).parent / "assets" / "clip.webm", workdir / "out" / "clip.webm")
    artifacts = []
    if p.get("asset"):
        root = workdir / spec["mounts"][p["asset"]]
        listing = "".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(root).as_posix()}\n"
                          for f in sorted(root.rglob("*")) if f.is_file())
        (workdir / "out" / "asset.txt").write_text(listing)
        artifacts.append({"name": "asset", "files": [{"path": "asset.txt", "local": "out/asset.txt"}]})
    artifacts += [
        {"name": "frames", "files": [{"path": frame_name(k), "local": f"out/frames/{frame_name(k)}",
                                      "thumbnail": {"local": f"out/thumbs/{frame_name(k)}"}}
                                     for k in range(frames)]},
        {"name": "clip", "files": [{"path": "clip.webm", "local": "out/clip.webm"}]},
        {"name": "log", "files": [{"path": "render.txt", "local": "out/render.txt"}]}]
    digest = hashlib.sha256("".join(digests).encode()).hexdigest()
    replace_text(out, json.dumps({
        "envelope": 1, "schema": "reel/result@1", "module_version": "0.1.0", "protocol": 1,
        "effective": {"frames": frames, "resumed_at": start}, "artifacts": artifacts,
        "payload": {"frames": frames, "digest": digest, "paused_s": round(ctl.paused_s, 3)}}))
    return 0


def main():
    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers(dest="verb", required=True)
    r = verbs.add_parser("run")
    for flag in ("--spec", "--workdir", "--out"):
        r.add_argument(flag, required=True)
    r.add_argument("--events")
    verbs.add_parser("doctor").add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.verb == "doctor":
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": [], "checks": [
                              {"name": "python", "ok": True, "detail": sys.version.split()[0]}]}))
        return 0
    return run(args.spec, Path(args.workdir), Path(args.out), args.events)


if __name__ == "__main__":
    sys.exit(main())
