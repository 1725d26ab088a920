/* What the stand-in libraries share: the stand-in CUDA runtime (libcudart.so.13) exports these for its cuDNN
 * stand-in (libcudnn.so.9), which records the workspace sizes it answered into the same report.
 *
 * The stand-in is for measurement only (bench/standin/README.md): it lets the real CUDA build of Caffe run its GPU
 * path on a machine without a GPU and counts what Caffe asks the device for. Nothing in the package loads it. */
#ifndef DIGITS_MEMPLUGIN_STANDIN_H
#define DIGITS_MEMPLUGIN_STANDIN_H

#include <stdio.h>

#define STANDIN_EXPORT __attribute__((visibility("default")))

/* A report section: called when the report is written, with the report's file open at the place where the
 * section's JSON value goes (the section's name is written before it). */
typedef void (*standin_section_writer)(FILE *out);

STANDIN_EXPORT void digits_memplugin_standin_add_section(const char *name, standin_section_writer writer);

/* A JSON string, escaped, quotes included. */
STANDIN_EXPORT void digits_memplugin_standin_json_string(FILE *out, const char *text);

#endif
