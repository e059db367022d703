#include "vipc_errors.h"

#include <string.h>

const char *vipc_strerror(int code) {
  switch (code) {
    case VIPC_EPROTOCOL:
      return "the VisionIPC peer broke the handshake protocol";
    case VIPC_ENOTALLOWED:
      return "the VisionIPC server does not serve this process's uid";
    case VIPC_EUNKNOWNSTREAM:
      return "the VisionIPC server has no such stream (yet)";
    case VIPC_EBADPACKET:
      return "not a VisionIPC frame packet";
    case VIPC_EGEOMETRY:
      return "impossible buffer geometry";
    default:
      break;
  }
  if (code < 0 && code > -4096) return strerror(-code);
  return "unknown VisionIPC error";
}
