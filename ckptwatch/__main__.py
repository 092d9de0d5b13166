from ckptwatch.entry import main

main()
