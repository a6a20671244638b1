/* cpu_threads.h - the thread count of the CPU kernels' parallel regions. */
#ifndef ND_CPU_THREADS_H
#define ND_CPU_THREADS_H

/* At most nd_get_num_threads(); fewer while other processes keep this
 * process's CPUs busy (cpu_threads.c). Ask outside parallel regions, where
 * a region's count is decided. */
int nd_cpu_threads(void);

#endif
