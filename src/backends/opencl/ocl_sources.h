/* ocl_sources.h - the kernels/NAME.cl sources, embedded at build time by
 * cmake/embed_cl.cmake (name: the file name without ".cl"). */
#ifndef ND_OCL_SOURCES_H
#define ND_OCL_SOURCES_H

struct nd_ocl_source {
    const char *name;
    const char *src;
};
extern const struct nd_ocl_source nd_ocl_sources[];
extern const unsigned long nd_ocl_source_count;

#endif
