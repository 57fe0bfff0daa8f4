from hrm_deploy.cli import main

main()
