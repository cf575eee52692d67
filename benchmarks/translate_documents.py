"""Documents: Multi30k test2016 sentences joined into paragraphs, translated whole or sentence by sentence.

    .venv/bin/python benchmarks/translate_documents.py CKPT [--src de] [--tgt en] [--size 5] [--beam 5]
        [--repeats 3] [--data ../shared/data] [--out OUT]

The 1,000 test sentences, in order, joined by a space into paragraphs of --size (200 of 5), translated three ways
through the Python API: each sentence on its own line, the translations of a paragraph's sentences then joined
(the reference way); each paragraph as one line with `split_sentences="never"` (the model sees a sequence five
times the length of its training sentences); and with `split_sentences="auto"` (the default: the splitter, then
the sentences in the same batches). sacreBLEU of the paragraphs against the references joined the same way, how
many paragraphs equal the reference way's, and the best time of --repeats for each (the time of splitting: auto's
against the sentence by sentence run). Results: benchmarks/results/translate_documents.{json,md}, with the CPU named.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from common import SHARED_DATA, best_of, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--size", type=int, default=5)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--out", default=str(RESULTS / "translate_documents"))
    args = p.parse_args()
    import sacrebleu

    import tfcli
    from tfcli import checkpoint_meta
    from tfcli.runtime import tune_process

    tune_process("cpu", args.threads)
    data = Path(args.data) / "multi30k"
    lines = (data / f"test2016.{args.src}").read_text(encoding="utf-8").splitlines()
    refs = (data / f"test2016.{args.tgt}").read_text(encoding="utf-8").splitlines()
    k = args.size
    paras = [" ".join(lines[i : i + k]) for i in range(0, len(lines), k)]
    para_refs = [" ".join(refs[i : i + k]) for i in range(0, len(refs), k)]
    t = tfcli.load(args.checkpoint, device="cpu")
    opts = dict(beam_size=args.beam, batch_size=args.batch)

    def by_sentence() -> list[str]:
        out = t.translate(lines, **opts)
        return [" ".join(out[i : i + k]) for i in range(0, len(out), k)]

    ways = {"sentence by sentence": by_sentence,
            "never": lambda: t.translate(paras, split_sentences="never", src_lang=args.src, **opts),
            "auto": lambda: t.translate(paras, split_sentences="auto", src_lang=args.src, **opts)}
    outputs, times = best_of(ways, args.repeats)
    ref_way = outputs["sentence by sentence"]
    res = {"command": shlex.join([".venv/bin/python", "benchmarks/translate_documents.py", *sys.argv[1:]]),
           "cpu": cpu_name(), "threads": args.threads, "checkpoint": str(checkpoint_meta.resolve(args.checkpoint)),
           "direction": f"{args.src}-{args.tgt}", "paragraph_size": k, "paragraphs": len(paras), "beam": args.beam,
           "batch": args.batch, "date": time.strftime("%Y-%m-%d %H:%M"), "ways": {}}
    for name in ways:
        res["ways"][name] = {
            "bleu": sacrebleu.corpus_bleu(outputs[name], [para_refs]).score, "best_s": min(times[name]),
            "same_as_sentence_by_sentence": sum(a == b for a, b in zip(outputs[name], ref_way)) / len(paras),
            "mean_words": sum(len(o.split()) for o in outputs[name]) / len(paras)}
    ways_md = [f"| {name} | {w['bleu']:.2f} | {w['best_s']:.2f} | {w['same_as_sentence_by_sentence']:.1%} | "
               f"{w['mean_words']:.1f} |" for name, w in res["ways"].items()]
    cost = res["ways"]["auto"]["best_s"] / res["ways"]["sentence by sentence"]["best_s"]
    res["auto_time_over_sentence_by_sentence"] = cost
    md = [f"# Documents: Multi30k test2016 {args.src}->{args.tgt} in paragraphs of {k}", "",
          f"CPU: {res['cpu']}, {args.threads} threads. Checkpoint `{res['checkpoint']}`; {len(paras)} paragraphs, "
          f"beam {args.beam}, batch {args.batch}; best of {args.repeats}; {res['date']}. Written by "
          "`benchmarks/translate_documents.py`.", "",
          "| way | paragraph BLEU | seconds | paragraphs as sentence by sentence | words a paragraph |",
          "| --- | ---: | ---: | ---: | ---: |", *ways_md, "",
          f"- reference words a paragraph: {sum(len(r.split()) for r in para_refs) / len(para_refs):.1f}",
          f"- the time of auto (splitting, then the sentences) over sentence by sentence: {cost:.2f}x", "",
          f"Command: `{res['command']}`.", ""]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
