/* Which AVX-512 instructions share the VNNI dot product's issue slots on this CPU: 8 independent
 * vpdpbusd a loop iteration, alone and with 4 independent instructions of one kind beside them.
 * gcc -O2 -march=native ports.c -o ports && ./ports   (one core; 3.66 GHz: the rate of vpdpbusd alone) */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define DP "vpdpbusd %[x],%[y],%[a0]\n\tvpdpbusd %[x],%[y],%[a1]\n\tvpdpbusd %[x],%[y],%[a2]\n\tvpdpbusd %[x],%[y],%[a3]\n\tvpdpbusd %[x],%[y],%[a4]\n\tvpdpbusd %[x],%[y],%[a5]\n\tvpdpbusd %[x],%[y],%[a6]\n\tvpdpbusd %[x],%[y],%[a7]\n\t"
#define OUTS [a0]"+v"(a0),[a1]"+v"(a1),[a2]"+v"(a2),[a3]"+v"(a3),[a4]"+v"(a4),[a5]"+v"(a5),[a6]"+v"(a6),[a7]"+v"(a7),[b0]"+v"(b0),[b1]"+v"(b1),[b2]"+v"(b2),[b3]"+v"(b3)
#define RUN(name, extra) { double t=now(); for(long i=0;i<N;i++){ __asm__ volatile(DP extra : OUTS : [x]"v"(x),[y]"v"(y)); } printf("%-28s %.2f cycles at 3.66 GHz (ns/iter %.3f)\n", name, (now()-t)/N*1e9*3.66, (now()-t)/N*1e9); }
int main(){
  long N=100000000;
  __m512i a0=_mm512_set1_epi32(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,b0=a0,b1=a0,b2=a0,b3=a0,x=_mm512_set1_epi32(3),y=_mm512_set1_epi32(5);
  RUN("8 dpbusd", "")
  RUN("+4 vpaddd", "vpaddd %[x],%[b0],%[b0]\n\tvpaddd %[x],%[b1],%[b1]\n\tvpaddd %[x],%[b2],%[b2]\n\tvpaddd %[x],%[b3],%[b3]\n\t")
  RUN("+4 vpandd", "vpandd %[x],%[b0],%[b0]\n\tvpandd %[x],%[b1],%[b1]\n\tvpandd %[x],%[b2],%[b2]\n\tvpandd %[x],%[b3],%[b3]\n\t")
  RUN("+4 vpsrlw", "vpsrlw $4,%[x],%[b0]\n\tvpsrlw $4,%[x],%[b1]\n\tvpsrlw $4,%[x],%[b2]\n\tvpsrlw $4,%[x],%[b3]\n\t")
  RUN("+4 vcvtdq2ps", "vcvtdq2ps %[x],%[b0]\n\tvcvtdq2ps %[x],%[b1]\n\tvcvtdq2ps %[x],%[b2]\n\tvcvtdq2ps %[x],%[b3]\n\t")
  RUN("+4 vpmulld", "vpmulld %[x],%[b0],%[b0]\n\tvpmulld %[x],%[b1],%[b1]\n\tvpmulld %[x],%[b2],%[b2]\n\tvpmulld %[x],%[b3],%[b3]\n\t")
  RUN("+4 vmulps", "vmulps %[x],%[b0],%[b0]\n\tvmulps %[x],%[b1],%[b1]\n\tvmulps %[x],%[b2],%[b2]\n\tvmulps %[x],%[b3],%[b3]\n\t")
  RUN("+4 vfmadd231ps", "vfmadd231ps %[x],%[x],%[b0]\n\tvfmadd231ps %[x],%[x],%[b1]\n\tvfmadd231ps %[x],%[x],%[b2]\n\tvfmadd231ps %[x],%[x],%[b3]\n\t")
  RUN("+4 vaddps", "vaddps %[x],%[b0],%[b0]\n\tvaddps %[x],%[b1],%[b1]\n\tvaddps %[x],%[b2],%[b2]\n\tvaddps %[x],%[b3],%[b3]\n\t")
  RUN("+4 vpmaddwd", "vpmaddwd %[x],%[b0],%[b0]\n\tvpmaddwd %[x],%[b1],%[b1]\n\tvpmaddwd %[x],%[b2],%[b2]\n\tvpmaddwd %[x],%[b3],%[b3]\n\t")
  int s[16]; _mm512_storeu_si512(s,_mm512_add_epi32(_mm512_add_epi32(a0,a7),b3)); printf("%d\n",s[0]);
}
