#pragma once
/// Fault injection for the reliability tests: FLUXMPI_FAULT="<kind>@<rank>:<step>" makes rank
/// <rank> misbehave when it reaches denoising step <step>:
///   throw   raise an InternalError (the rank reports it and aborts the job)
///   kill    SIGKILL itself (the launcher must end the job; the checkpoint must stay readable)
///   header  send its next message with a wrong step in the header (the receiver's CommError)
///   patch   in a patch-pipelined step, send its next message labelled with the next patch
/// Unset: no fault. FLUXMPI_DELAY="<rank>:<milliseconds>" makes rank <rank> sleep that long before
/// each unit of work (every pass of every step it runs): a slow pipeline, for the tests of the
/// dynamic hand-out (`--stages`). Each rank reads its own environment (mpirun passes it to every
/// rank). Ranks are world ranks.

#include <cstdint>
#include <string>

namespace fluxmpi::pipeline {

struct Fault {
  enum class Kind { None, Throw, Kill, Header, Patch };
  Kind kind = Kind::None;
  int rank = -1;
  int64_t step = -1;
  int delay_rank = -1;     ///< FLUXMPI_DELAY: the slow rank (-1: none)
  int64_t delay_ms = 0;    ///< its delay before each unit of work

  /// Parses "<kind>@<rank>:<step>"; UsageError naming FLUXMPI_FAULT otherwise.
  static Fault parse(const std::string& text);
  /// Adds "<rank>:<milliseconds>" to `fault`; UsageError naming FLUXMPI_DELAY otherwise.
  static void parse_delay(const std::string& text, Fault& fault);
  /// From the environment variables FLUXMPI_FAULT and FLUXMPI_DELAY.
  static Fault from_environment();
  bool fires(int at_rank, int64_t at_step) const { return kind != Kind::None && rank == at_rank && step == at_step; }
};

/// Sleeps when `rank` is the delayed one; throws or kills when `fault` fires here (Header and Patch
/// faults are the messenger user's business).
void trigger(const Fault& fault, int rank, int64_t step);

}  // namespace fluxmpi::pipeline
