#include <omp.h>
int main(void) {
    int n = 0;
#pragma omp parallel reduction(+:n)
    n += omp_get_num_threads() > 0;
    return n > 0 ? 0 : 1;
}
