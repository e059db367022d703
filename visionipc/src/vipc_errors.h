/* Error codes of VisionIPC's C code. Functions return 0 (or a count) on success and a
 * negative code on failure: -errno from the OS, or one of these. vipc_strerror() names
 * them (and -errno); parsers also hand out a static sentence saying exactly what was
 * wrong. */
#ifndef VISIONIPC_ERRORS_H
#define VISIONIPC_ERRORS_H

enum vipc_error {
  VIPC_EPROTOCOL = -3001,      /* a handshake message breaks the wire format */
  VIPC_ENOTALLOWED = -3002,    /* the server refused this peer (uid policy) */
  VIPC_EUNKNOWNSTREAM = -3003, /* the server has no such stream (yet) */
  VIPC_EBADPACKET = -3004,     /* bytes on a stream's endpoint that are not a frame packet */
  VIPC_EGEOMETRY = -3005,      /* width/height/stride/uv_offset/size describe no buffer */
};

const char *vipc_strerror(int code);

#endif
