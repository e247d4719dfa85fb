"""SGLang test harnesses (no tests here): `harness` launches real CPU servers, `scheduler` drives
SGLang's radix caches over an `OscarPagedAllocator` the way SGLang's scheduler does."""
