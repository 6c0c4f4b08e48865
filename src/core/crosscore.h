/*
 * crosscore.h - a probe of the machine rather than of the buffer: how long
 * one cache line takes to go from one thread's core to another's and back.
 *
 *   this thread                   a second thread
 *   ball = 2k + 1  ─── line ───►  sees 2k + 1, writes 2k + 2
 *   sees 2k + 2    ◄── line ────
 *
 * Two threads sharing a buffer pass its lines (lock words, the tree's
 * nodes, the tables) between their cores in the same way, so the thread
 * benchmarks record this next to their rounds: on a virtual machine it
 * can change by several times from one minute to the next, as the host
 * places the two virtual CPUs (docs/benchmarks.md, "Two machines in
 * one").
 */
#ifndef EXR_CROSSCORE_H
#define EXR_CROSSCORE_H

/* The median, over the batches of 256 round trips made in about `secs`
 * seconds (0 < secs <= 10; at most 65,536 batches, which at 100 ns a round
 * trip take 1.7 s), of a round trip's nanoseconds; a second thread is
 * started and joined for it. When the two threads do not run at once
 * (one core, or the other one busy), a round trip waits for the scheduler:
 * the result is then in the microseconds or more. A negative value: the
 * thread could not be started, or memory was short. */
double exr_crosscore_ns(double secs);

#endif
