"""Speech benchmark: how fast whisper-base transcribes here, and whether a long voice note delays other chats.

    .venv/bin/python bench/bench_voice.py                        # ASR_CPU_THREADS 1 and 2, three rounds each
    .venv/bin/python bench/bench_voice.py --threads 2 --repeat 5 --new-tokens 64

Part 1, the real-time factor. The bot's own local speech backend (`LocalTranscriber`: its speech thread, PyAV
decoding, faster-whisper with the whisper-base weights in int8 that scripts/fetch_assets.sh fetches) transcribes
tests/data/question_en.ogg (2.9 s), question_zh.ogg (9.3 s) and a 60-second voice note: the English question over
and over with a second's pause between, encoded as Telegram sends voice notes (OGG/Opus, with PyAV). RTF is the
seconds a transcription takes, decoding included, over the seconds of audio (below 1: faster than it was spoken);
on a machine others load too, the wall-clock figure says more about them than about whisper, so the CPU time the
process spent (all its threads; nothing else runs meanwhile) is shown beside it: `cpu_rtf` is CPU seconds per
second of audio, what the transcription costs whatever the load (on an idle box its wall-clock RTF is about
`cpu_rtf` divided by the threads it may use). The model is loaded, and one warm-up recording transcribed, before
anything is timed.

Part 2, other chats while a voice note is transcribed. The local chat engine (`LocalLLM` on the offline
SmolLM2-135M GGUF: the model thread the bot's chats share) answers another chat's model calls of exactly
`--new-tokens` tokens one after another, first alone, then while the 60-second note is transcribed on the speech
thread (as many calls as fit in that transcription, and at least `--calls`). Both phases measure each call's
latency and the event loop's lag (a 10 ms ticker, bench/measures.py): the question is whether the loop and the
model thread stay free, and what sharing the CPU cores costs the chat.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import av  # noqa: E402
import numpy as np  # noqa: E402

from agent.llm.base import ModelRequest  # noqa: E402
from agent.llm.local import LocalLLM  # noqa: E402
from agent.speech.audio import SAMPLE_RATE, decode_audio  # noqa: E402
from agent.speech.base import SpeechLimits  # noqa: E402
from agent.speech.local import LocalTranscriber  # noqa: E402
from bench.measures import LagMeter, median  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WHISPER = ROOT / ".cache" / "models" / "whisper-base"
GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
RECORDINGS = ROOT / "tests" / "data"
PROMPT = [{"role": "user", "content": "How many lessons does the machine learning course have?"}]


def long_voice_note(seconds: float = 60.0) -> bytes:
    """`seconds` of the English question said again and again, a second's pause between, as OGG/Opus."""
    speech = decode_audio((RECORDINGS / "question_en.ogg").read_bytes(), 60).samples
    pause = np.zeros(SAMPLE_RATE, dtype=np.float32)
    pieces, total = [], 0
    while total < seconds * SAMPLE_RATE:
        pieces += [speech, pause]
        total += len(speech) + len(pause)
    samples = (np.concatenate(pieces)[: int(seconds * SAMPLE_RATE)] * 32767).astype(np.int16)
    return _opus(samples)


def _opus(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=SAMPLE_RATE, layout="mono")
        stream.bit_rate = 24_000
        for start in range(0, len(samples), 960):
            frame = av.AudioFrame.from_ndarray(samples[None, start:start + 960], format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


async def real_time_factors(transcriber: LocalTranscriber, recordings: dict[str, bytes], repeat: int) -> dict:
    """Per recording: its length, the median seconds to transcribe it, the RTF, and what was heard."""
    rows = {}
    for name, data in recordings.items():
        times, cpu_times, transcript = [], [], None
        for _ in range(repeat):
            started, cpu_started = time.perf_counter(), time.process_time()
            transcript = await transcriber.transcribe(data)
            times.append(time.perf_counter() - started)
            cpu_times.append(time.process_time() - cpu_started)
        taken, cpu = median(times), median(cpu_times)
        rows[name] = {"audio_s": round(transcript.audio_seconds, 2), "median_s": round(taken, 2),
                      "rtf": round(taken / transcript.audio_seconds, 3), "cpu_s": round(cpu, 2),
                      "cpu_rtf": round(cpu / transcript.audio_seconds, 3), "language": transcript.language,
                      "heard": transcript.text[:80]}
    return rows


async def timed_call(llm: LocalLLM, new_tokens: int) -> float:
    started = time.perf_counter()
    await llm.complete(ModelRequest(PROMPT, max_new_tokens=new_tokens))
    return time.perf_counter() - started


async def other_chat(llm: LocalLLM, transcriber: LocalTranscriber, note: bytes, calls: int, new_tokens: int) -> dict:
    """Another chat's model calls alone, then during the long note's transcription: latencies and loop lag."""
    async with LagMeter() as alone_lag:
        alone = [await timed_call(llm, new_tokens) for _ in range(calls)]
    async with LagMeter() as during_lag:
        transcription = asyncio.create_task(transcriber.transcribe(note))
        started = time.perf_counter()
        during = []
        while not transcription.done() or len(during) < calls:
            during.append(await timed_call(llm, new_tokens))
        await transcription
        transcribed_s = time.perf_counter() - started
    return {"alone_median_s": round(median(alone), 3), "during_median_s": round(median(during), 3),
            "during_calls": len(during), "loop_lag_p99_ms_alone": round(alone_lag.p99_ms(), 1),
            "loop_lag_p99_ms_during": round(during_lag.p99_ms(), 1),
            "loop_lag_max_ms_during": round(max(during_lag.lags) * 1000, 1),
            "note_transcribed_s_while_chatting": round(transcribed_s, 2)}


def machine() -> dict:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {"cpus": os.cpu_count(), "avx512_bf16": "avx512_bf16" in flags, "python": platform.python_version(),
            "load_average": [round(load, 2) for load in os.getloadavg()]}


async def run(args: argparse.Namespace) -> dict:
    note = long_voice_note()
    recordings = {"question_en.ogg": (RECORDINGS / "question_en.ogg").read_bytes(),
                  "question_zh.ogg": (RECORDINGS / "question_zh.ogg").read_bytes(), "voice note, 60 s": note}
    report: dict = {"machine_before": machine(), "rows": {}}
    llm = LocalLLM(str(GGUF), device_map="cpu", dtype="auto", min_new_tokens=args.new_tokens)
    await llm.start()
    try:
        await timed_call(llm, args.new_tokens)  # warm-up
        for threads in args.threads:
            transcriber = LocalTranscriber(str(WHISPER), cpu_threads=threads,
                                           limits=SpeechLimits(max_seconds=120, timeout_seconds=600))
            try:
                await transcriber.load()
                await transcriber.transcribe(recordings["question_en.ogg"])  # warm-up
                row = {"rtf": await real_time_factors(transcriber, recordings, args.repeat)}
                if not args.no_chat:
                    row["other_chat"] = await other_chat(llm, transcriber, note, args.calls, args.new_tokens)
            finally:
                await transcriber.close()
            report["rows"][f"ASR_CPU_THREADS={threads}"] = row
            print(json.dumps({f"ASR_CPU_THREADS={threads}": row}, ensure_ascii=False), flush=True)
    finally:
        await llm.close()
    report["machine_after"] = machine()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="ASR_CPU_THREADS values to run")
    parser.add_argument("--repeat", type=int, default=3, help="transcriptions of each recording (median shown)")
    parser.add_argument("--calls", type=int, default=5, help="the other chat's calls alone (and at least during)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens in each of the other chat's calls")
    parser.add_argument("--no-chat", action="store_true", help="part 1 only (no other chat)")
    parser.add_argument("--json", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    for needed in (WHISPER / "model.bin", GGUF):
        if not needed.exists():
            print(f"bench_voice: {needed} is missing: run scripts/fetch_assets.sh", file=sys.stderr)
            return 2
    report = asyncio.run(run(args))
    print(json.dumps(report, ensure_ascii=False, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
