/* Error codes of the msgq core. Functions return 0 or a positive count on success and a
 * negative code on failure: either -errno (the OS said no) or one of the MSGQ_E* codes
 * below (the queue or the caller's input is wrong). msgq_strerror() names both. */
#ifndef MSGQ_ERRORS_H
#define MSGQ_ERRORS_H

enum msgq_error {
  MSGQ_EBADNAME = -2001,      /* endpoint or prefix name is not allowed */
  MSGQ_EBADMAGIC = -2002,     /* the file is not a msgq queue */
  MSGQ_EVERSION = -2003,      /* queue written by another layout version */
  MSGQ_EGEOMETRY = -2004,     /* header sizes disagree with each other or the file */
  MSGQ_ENOSLOT = -2005,       /* every reader slot is held by a live subscriber */
  MSGQ_ENOTOWNER = -2006,     /* another publisher took the queue over */
  MSGQ_ETOOLARGE = -2007,     /* message larger than a third of the queue */
  MSGQ_EBADSIZE = -2008,      /* segment size the layout cannot hold */
  MSGQ_ESIZEMISMATCH = -2009, /* queue exists, in use, with another segment size */
  MSGQ_ENORESERVE = -2010,    /* commit without a reservation */
  MSGQ_EBUFFER = -2011,       /* caller's buffer is too small for the message */
  MSGQ_ESUPERSEDED = -2012,   /* the queue file was replaced: open the endpoint again */
  MSGQ_ECHECKSUM = -2013,     /* a message's bytes do not match its CRC32C */
  MSGQ_ECLOSED = -2014,       /* the handle lost its queue (a re-open failed; msgq.h O6) */
};

/* A static, human-readable description of a code from this file or of -errno. */
const char *msgq_strerror(int code);

#endif
