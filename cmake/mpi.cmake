# MPI transport (RINGREDUCE_WITH_MPI = AUTO | ON | OFF). Not built yet.
set(RR_WITH_MPI_VALUE 0)
