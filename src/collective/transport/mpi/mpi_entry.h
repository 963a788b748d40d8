// The MPI transport's row of the transport table (Note [transport table]), in every build: a build
// without MPI still knows MWMS_TRANSPORT=mpi and says why no pair can use it.
#pragma once

#include "collective/transport/transport.h"

namespace mwms::collective {

/// Only when MWMS_TRANSPORT=mpi (never under auto: MPI is what the user asks for under mpirun);
/// a pair can use it when both ends published an MPI address (make_mpi_transport).
extern const TransportEntry kMpiTransportEntry;

}  // namespace mwms::collective
