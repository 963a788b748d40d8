/// @file mwms.h
/// Umbrella header: everything a user of libmwms compiles against.
#pragma once

#include "mwms/api.h"
#include "mwms/cluster.h"
#include "mwms/communicator.h"
#include "mwms/config.h"
#include "mwms/device_communicator.h"
#include "mwms/errors.h"
#include "mwms/optimizer.h"
#include "mwms/options.h"
#include "mwms/parameter_server.h"
#include "mwms/ps_placement.h"
#include "mwms/session.h"
#include "mwms/strategy.h"
#include "mwms/types.h"
#include "mwms/version.h"
