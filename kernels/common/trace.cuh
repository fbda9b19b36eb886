// A measured timeline of one CTA: the instrumented build (-DTRACE=1) of a phase records what the threads
// of its CTA 0 do, each event stamped with the SM's cycle counter, into a buffer the host reads after the
// launch (flashcore_nb/trace.py draws it). It is a trace, not a model: every span on the figure is two
// stamps taken on the GPU.
//
// Who records: one thread per role (warpgroup), a TraceRecorder each. A role's events go to its own fixed
// slots, in program order, so recording is one clock read and one 16-byte store per event: no atomics,
// no shared memory, no barrier. What that perturbs: the recording thread's warp waits for the clock read
// and issues the store (a few cycles each, the store never waited for). What it cannot promise: a stamp
// stays in order with the barriers, copies and wgmmas (volatile asm, like the stamp), but register
// arithmetic may be scheduled across it, and it does not wait for the results of the instructions before
// it, so a span's ends are good to some tens of cycles. Only CTA 0 records; the other CTAs run the same
// instructions with the stores skipped.
//
// clock64 counts cycles of one SM, consistent across the warps of one CTA but not between SMs; each role
// also stamps %globaltimer (ns) beside the clock at its first and last event, so the host converts cycles
// to nanoseconds from the CTA's own span.
//
// Host side (this header, once per phase's translation unit): three extern "C" functions, defined only in
// a TRACE=1 build. A default build has no such symbols (the Python side says "built without TRACE=1"),
// and with TRACE=0 every TraceRecorder method is empty: the default build's machine code is unchanged.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#ifndef TRACE
#define TRACE 0
#endif

// What happened. flashcore_nb/trace.py mirrors this list (a test compares them); *Begin / *End and
// *Issue / *Done are the two ends of one span.
enum TraceKind : uint8_t {
  kTraceQIssue = 0,            // producer: Q's TMA copies issued (tile -1)
  kTraceKVIssue = 1,           // producer: tile's K and V copies issued
  kTraceEmptyWaitBegin = 2,    // producer: waiting for a buffer to be released (tile -1: Q's buffer)
  kTraceEmptyWaitEnd = 3,
  kTraceQWaitBegin = 4,        // consumer: waiting for Q to land
  kTraceQWaitEnd = 5,
  kTraceKWaitBegin = 6,        // consumer: waiting for a K tile to land (the k_full barrier)
  kTraceKWaitEnd = 7,
  kTraceVWaitBegin = 8,        // consumer: waiting for a V tile to land (the v_full barrier)
  kTraceVWaitEnd = 9,
  kTraceScoresIssue = 10,      // consumer: S = Q·Kᵀ wgmmas issued ...
  kTraceScoresDone = 11,       // ... and waited for
  kTraceValuesIssue = 12,      // consumer: O += P·V wgmmas issued ...
  kTraceValuesDone = 13,       // ... and waited for
  kTraceSoftmaxBegin = 14,
  kTraceSoftmaxEnd = 15,
  kTraceRelease = 16,          // consumer: the warp released a K/V buffer
  kTraceEpilogueBegin = 17,
  kTraceEpilogueEnd = 18,
  kTraceTurnWait = 19,         // consumer (ping-pong): waiting for its turn to issue ...
  kTraceTurnTaken = 20,        // ... got it
  kTraceTurnHanded = 21,       // ... handed it to the other consumer
};

// One event, 16 bytes: item is the ordinal of the CTA's work item (persistent CTAs walk several), tile the
// key tile (or -1 where none applies).
struct TraceEvent {
  unsigned long long cycles;   // clock64
  uint16_t item;
  uint8_t kind;                // TraceKind
  uint8_t role;                // warpgroup: 0 the producer, 1.. the consumers
  int32_t tile;
};
static_assert(sizeof(TraceEvent) == 16, "the host reads TraceEvent as 16 bytes");

// The two clocks read together: at a role's first event ([0]) and its last ([1]).
struct TraceClock {
  unsigned long long cycles;   // clock64
  unsigned long long ns;       // %globaltimer
};

constexpr int kTraceRoles = 4;          // the producer and up to three consumers
constexpr int kTraceCapacity = 8192;    // events per role; beyond it they are counted, not stored

#if TRACE
static __device__ TraceEvent trace_events[kTraceRoles][kTraceCapacity];
static __device__ unsigned trace_counts[kTraceRoles];     // events each role had (may exceed the capacity)
static __device__ TraceClock trace_clocks[kTraceRoles][2];

__device__ __forceinline__ unsigned long long trace_globaltimer() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns));
  return ns;
}

__device__ __forceinline__ unsigned long long trace_clock() {
  unsigned long long cycles;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(cycles) :: "memory");
  return cycles;
}
#endif

// One role's recorder. Every thread of the role holds one and calls it alike (the count stays uniform);
// only the thread named `recording` in CTA 0 stores.
struct TraceRecorder {
#if TRACE
  uint8_t role;
  bool active;
  unsigned count = 0;
#endif

  __device__ __forceinline__ TraceRecorder(int role, bool recording) {
#if TRACE
    this->role = static_cast<uint8_t>(role);
    active = recording && blockIdx.x == 0 && role < kTraceRoles;
#endif
  }

  // The clocks at the role's first event.
  __device__ __forceinline__ void begin() {
#if TRACE
    if (active) trace_clocks[role][0] = {trace_clock(), trace_globaltimer()};
#endif
  }

  __device__ __forceinline__ void stamp(TraceKind kind, int item, int tile = -1) {
#if TRACE
    const unsigned long long now = trace_clock();
    if (active && count < kTraceCapacity)
      trace_events[role][count] = {now, static_cast<uint16_t>(item), kind, role, tile};
    ++count;
#endif
  }

  // The clocks at the role's last event, and how many it had.
  __device__ __forceinline__ void end() {
#if TRACE
    if (active) {
      trace_clocks[role][1] = {trace_clock(), trace_globaltimer()};
      trace_counts[role] = count;
    }
#endif
  }
};

#if TRACE
// The buffer's shape: roles, and events per role (what the host allocates for flashcore_trace_read).
extern "C" void flashcore_trace_shape(int* roles, int* capacity) {
  *roles = kTraceRoles;
  *capacity = kTraceCapacity;
}

// Before a traced launch: no events, no clocks (a role that never runs reads as count 0).
extern "C" cudaError_t flashcore_trace_reset() {
  const unsigned counts[kTraceRoles] = {};
  const TraceClock clocks[kTraceRoles][2] = {};
  cudaError_t err = cudaMemcpyToSymbol(trace_counts, counts, sizeof(counts));
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(trace_clocks, clocks, sizeof(clocks));
  return err;
}

// After it (these copies wait for the launch): events [kTraceRoles][kTraceCapacity], counts [kTraceRoles],
// clocks [kTraceRoles][2].
extern "C" cudaError_t flashcore_trace_read(TraceEvent* events, unsigned* counts, TraceClock* clocks) {
  cudaError_t err = cudaMemcpyFromSymbol(events, trace_events, sizeof(trace_events));
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(counts, trace_counts, sizeof(trace_counts));
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(clocks, trace_clocks, sizeof(trace_clocks));
  return err;
}
#endif
