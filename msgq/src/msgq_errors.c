#include "msgq_errors.h"

#include <string.h>

const char *msgq_strerror(int code) {
  switch (code) {
    case MSGQ_EBADNAME:
      return "invalid name: use 1-100 letters, digits, '_', '-' or '.', not '.' or '..'";
    case MSGQ_EBADMAGIC:
      return "file is not a msgq queue (bad magic number)";
    case MSGQ_EVERSION:
      return "queue was created by an incompatible msgq layout version";
    case MSGQ_EGEOMETRY:
      return "queue header is inconsistent with itself or with the file size";
    case MSGQ_ENOSLOT:
      return "every reader slot of the queue is held by a live subscriber";
    case MSGQ_ENOTOWNER:
      return "another publisher has taken over this endpoint";
    case MSGQ_ETOOLARGE:
      return "message is larger than a third of the queue's segment size";
    case MSGQ_EBADSIZE:
      return "segment size out of range";
    case MSGQ_ESIZEMISMATCH:
      return "queue is in use with a smaller segment size than requested";
    case MSGQ_ENORESERVE:
      return "commit without a matching reserve";
    case MSGQ_EBUFFER:
      return "buffer too small for the message";
    case MSGQ_ESUPERSEDED:
      return "the queue file was replaced under its name; open the endpoint again";
    case MSGQ_ECHECKSUM:
      return "message bytes do not match their CRC32C checksum";
    case MSGQ_ECLOSED:
      return "the handle is not connected to a queue (a re-open failed); open it again";
    default:
      break;
  }
  if (code < 0 && code > -4096) return strerror(-code);
  return "unknown msgq error";
}
