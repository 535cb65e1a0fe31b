#pragma once
/// Fault injection for the reliability tests: FLUXMPI_FAULT="<kind>@<rank>:<step>" makes rank
/// <rank> misbehave when it reaches denoising step <step>:
///   throw   raise an InternalError (the rank reports it and aborts the job)
///   kill    SIGKILL itself (the launcher must end the job; the checkpoint must stay readable)
///   header  send its next message with a wrong step in the header (the receiver's CommError)
///   patch   in a patch-pipelined step, send its next message labelled with the next patch
/// Unset: no fault. Each rank reads its own environment (mpirun passes it to every rank).

#include <cstdint>
#include <string>

namespace fluxmpi::pipeline {

struct Fault {
  enum class Kind { None, Throw, Kill, Header, Patch };
  Kind kind = Kind::None;
  int rank = -1;
  int64_t step = -1;

  /// Parses "<kind>@<rank>:<step>"; UsageError naming FLUXMPI_FAULT otherwise.
  static Fault parse(const std::string& text);
  /// From the environment variable FLUXMPI_FAULT.
  static Fault from_environment();
  bool fires(int at_rank, int64_t at_step) const { return kind != Kind::None && rank == at_rank && step == at_step; }
};

/// Throws or kills when `fault` fires here (Header and Patch faults are the messenger user's business).
void trigger(const Fault& fault, int rank, int64_t step);

}  // namespace fluxmpi::pipeline
